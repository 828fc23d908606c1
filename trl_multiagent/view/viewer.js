// The rollout tree viewer (trl_multiagent.view): the recorded steps are embedded as JSON script tags, parsed when
// first shown, so that a page of many steps opens as fast as one of a single step.
"use strict";
(function () {
  const INDEX = JSON.parse(document.getElementById("index").textContent);
  const cache = new Map();
  const $ = (id) => document.getElementById(id);
  // `measure`: what the colours show, each joint action's "reward" (the default: what a reader compares across turns)
  // or its "return" (reward plus the discounted future, which grows with the turns still to come)
  const state = { step: null, prompt: 0, node: 0, doc: null, range: [0, 1], measure: "reward" };

  function loadStep(step) {
    if (!cache.has(step)) cache.set(step, JSON.parse(document.getElementById("step-" + step).textContent));
    return cache.get(step);
  }
  // HTML-escaped; control characters other than tab and newline (which HTML would drop or rewrite) shown as \xNN
  const esc = (s) =>
    String(s)
      .replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c])
      .replace(/[\x00-\x08\x0b-\x1f\x7f]/g, (c) => "\\x" + c.charCodeAt(0).toString(16).padStart(2, "0"));
  const fmt = (v) => (v === null || v === undefined ? "–" : Number(v).toFixed(4));
  const num = (name, v) => `<span class="${name}" data-value="${v === null || v === undefined ? "" : v}">${name} <b>${fmt(v)}</b></span>`;
  const mean = (xs) => (xs.length ? xs.reduce((a, b) => a + b, 0) / xs.length : null);

  // Low values red, middle yellow, high green, over the step's range of the joint actions' `state.measure`.
  const STOPS = [[215, 48, 39], [254, 224, 139], [26, 152, 80]];
  function colour(v) {
    if (v === null || v === undefined) return "#cccccc";
    const [lo, hi] = state.range;
    let t = hi > lo ? (v - lo) / (hi - lo) : 0.5;
    t = Math.max(0, Math.min(1, t)) * 2;
    const i = Math.min(1, Math.floor(t)), f = t - i, a = STOPS[i], b = STOPS[i + 1];
    return `rgb(${a.map((x, j) => Math.round(x + (b[j] - x) * f)).join(",")})`;
  }
  // A node's mean over its joint actions of "reward" or "return"
  function nodeMean(node, key) {
    return mean(node.actions.map((a) => a[key]).filter((v) => v !== null && v !== undefined));
  }
  // The labels under a node: its mean joint reward and its mean return
  const SHORT = { reward: "rew", return: "ret" };

  // ------------------------------------------------------------------ pickers
  function fillSteps() {
    $("step").innerHTML = INDEX.steps.map((s) => `<option value="${s}">step ${s}</option>`).join("");
    $("step").onchange = () => showStep(Number($("step").value));
    $("prompt").onchange = () => showPrompt(Number($("prompt").value));
    $("measure").onchange = () => {
      state.measure = $("measure").value;
      colourRange();
      drawTree();
      showNode(state.node);
    };
  }
  function colourRange() {
    const values = state.doc.prompts.flatMap((p) => p.nodes.flatMap((n) => n.actions.map((a) => a[state.measure]))).filter((v) => v !== null);
    // a loop, not Math.min(...values): spreading a few hundred thousand arguments overflows the stack
    let lo = Infinity, hi = -Infinity;
    for (const v of values) { if (v < lo) lo = v; if (v > hi) hi = v; }
    state.range = values.length ? [lo, hi] : [0, 1];
    $("measurename").textContent = state.measure === "reward" ? "joint reward" : "return";
    $("lo").textContent = fmt(state.range[0]);
    $("hi").textContent = fmt(state.range[1]);
  }
  function showStep(step) {
    state.step = step;
    state.doc = loadStep(step);
    $("step").value = String(step);
    colourRange();
    $("discount").textContent = state.doc.discount ?? "not recorded";
    const threshold = state.doc.early_termination_threshold;
    $("threshold").textContent = threshold === undefined ? "not recorded" : threshold === null ? "None: no node ends early" : String(threshold);
    $("prompt").innerHTML = state.doc.prompts
      .map((p, j) => {
        const text = p.nodes[0].agents[0].prompt.replace(/\s+/g, " ");
        return `<option value="${j}">#${j} (process ${p.process}, row ${p.row}) ${esc(text.slice(0, 70))}</option>`;
      })
      .join("");
    turnSummary();
    drawCurve();
    showPrompt(Math.min(state.prompt, state.doc.prompts.length - 1));
  }
  function showPrompt(j) {
    state.prompt = j;
    $("prompt").value = String(j);
    drawTree();
    showNode(0);
  }

  // ------------------------------------------------------------------ the tree
  function layout(nodes) {
    // Leaves get consecutive columns, each parent sits over the middle of its children; rows are turns.
    const children = nodes.map((n) => n.actions.map((a) => a.child).filter((c) => c !== null));
    const x = new Array(nodes.length);
    let next = 0;
    const place = (id) => {
      const kids = children[id];
      if (!kids.length) {
        x[id] = next++;
      } else {
        kids.forEach(place);
        x[id] = (x[kids[0]] + x[kids[kids.length - 1]]) / 2;
      }
    };
    nodes.forEach((n, id) => { if (n.parent === null) place(id); });
    return { x, width: Math.max(next, 1) };
  }
  function drawTree() {
    const prompt = state.doc.prompts[state.prompt];
    const nodes = prompt.nodes, k = state.doc.num_generations;
    const { x, width } = layout(nodes);
    // Wide columns while the tree fits the box; past that the box scrolls sideways
    const fit = ($("treebox").clientWidth - 70) / width;
    const col = Math.max(26, k * 9 + 12, Math.min(150, fit)), row = 96, left = 46, top = 26;
    const svgW = left + width * col + 20, turns = nodes.reduce((m, n) => Math.max(m, n.turn), 1);
    const svgH = top + turns * row;
    const cx = (id) => left + x[id] * col + col / 2, cy = (id) => top + (nodes[id].turn - 1) * row + 14;
    const parts = [];
    for (let t = 1; t <= turns; t++) parts.push(`<text class="turnlabel" x="4" y="${top + (t - 1) * row + 18}">turn ${t}</text>`);
    nodes.forEach((n, id) => {
      if (n.parent === null) return;
      const p = n.parent.node, sx = cx(p) - (k * 8) / 2 + n.parent.action * 8 + 4, sy = cy(p) + 26;
      const pruned = nodes[p].actions[n.parent.action].pruned ? " pruned" : "";
      parts.push(`<path class="edge${pruned}" d="M${sx},${sy} C${sx},${sy + 30} ${cx(id)},${cy(id) - 40} ${cx(id)},${cy(id) - 12}"/>`);
    });
    nodes.forEach((n, id) => {
      const reward = nodeMean(n, "reward"), ret = nodeMean(n, "return"), cls = "node" + (n.terminated ? " terminated" : "");
      const squares = n.actions
        .map((a, j) => `<rect class="action${a.pruned ? " pruned" : ""}" x="${cx(id) - (k * 8) / 2 + j * 8}" y="${cy(id) + 18}" width="8" height="8" fill="${colour(a[state.measure])}"><title>joint action ${j} (${a.choice.join(", ")}): reward ${fmt(a.reward)}, return ${fmt(a.return)}${a.pruned ? " (pruned)" : ""}</title></rect>`)
        .join("");
      // the coloured measure first, the other beside it
      const [first, second] = state.measure === "reward" ? [["reward", reward], ["return", ret]] : [["return", ret], ["reward", reward]];
      const values = [first, second].map(([key, v], line) => `<text class="value" data-key="${key}" data-value="${v ?? ""}" x="${cx(id)}" y="${cy(id) + 37 + line * 10}" text-anchor="middle">${SHORT[key]} ${v === null ? "–" : v.toFixed(2)}</text>`).join("");
      parts.push(
        `<g class="${cls}" data-node="${id}"><title>node ${id}, turn ${n.turn}: mean joint reward ${fmt(reward)}, mean return ${fmt(ret)}${n.terminated ? ", ended early" : ""}</title>` +
          (n.terminated ? `<circle class="ring" cx="${cx(id)}" cy="${cy(id)}" r="15"/>` : "") +
          `<circle class="body" cx="${cx(id)}" cy="${cy(id)}" r="11" fill="${colour(first[1])}"/><text x="${cx(id)}" y="${cy(id) + 3.5}" text-anchor="middle">${id}</text>${squares}${values}</g>`
      );
    });
    const svg = $("tree");
    svg.setAttribute("width", svgW);
    svg.setAttribute("height", svgH);
    svg.innerHTML = parts.join("");
  }

  // ------------------------------------------------------------------ the panel
  function completionHtml(c, agent, k) {
    const tags = [];
    if (c.truncated) tags.push('<span class="tag warn">truncated</span>');
    if (c.tool_calls !== undefined) tags.push(`<span class="tag">${c.tool_calls} tool call(s), ${c.tool_failures} failed</span>`);
    const messages = c.messages
      ? `<details><summary>tool calls and results</summary><pre>${esc(JSON.stringify(c.messages, null, 1))}</pre></details>`
      : "";
    // its own prompt, where the node's joint actions start from different observations
    const prompt = c.prompt !== undefined
      ? `<details class="prompt"><summary>its prompt (${c.prompt_tokens} tokens)</summary><pre>${esc(c.prompt)}</pre></details>`
      : "";
    return (
      `<div class="completion" data-agent="${agent}" data-k="${k}"><div><b>agent ${agent}</b> · completion ${k} · ${c.tokens} tokens ${tags.join("")}</div>${prompt}` +
      `<pre class="text">${esc(c.text)}</pre><div class="nums">${num("advantage", c.advantage)}${num("return", c.return)}</div>${messages}</div>`
    );
  }
  function showNode(id) {
    state.node = id;
    const doc = state.doc, nodes = doc.prompts[state.prompt].nodes, node = nodes[id];
    document.querySelectorAll("#tree .node").forEach((g) => g.classList.toggle("selected", Number(g.dataset.node) === id));
    const siblings = node.parent === null ? [id] : nodes[node.parent.node].actions.map((a) => a.child).filter((c) => c !== null);
    const nav = [];
    if (node.parent !== null) nav.push(`<button data-goto="${node.parent.node}">parent: node ${node.parent.node}, joint action ${node.parent.action}</button>`);
    const sib = siblings
      .map((s) => `<button class="sibling${s === id ? " current" : ""}" data-goto="${s}">node ${s} · reward ${fmt(nodeMean(nodes[s], "reward"))} · return ${fmt(nodeMean(nodes[s], "return"))}</button>`)
      .join("");
    const prompts = node.agents
      .map((a, i) => `<details class="prompt" data-agent="${i}"><summary>agent ${i}'s prompt (${a.prompt_tokens ?? "?"} tokens)</summary><pre>${esc(a.prompt)}</pre></details>`)
      .join("");
    const actions = node.actions
      .map((a, j) => {
        const rewards = Object.entries(a.rewards).map(([name, v]) => `<span class="fn" data-fn="${esc(name)}" data-value="${v ?? ""}">${esc(name)} <b>${fmt(v)}</b></span>`).join(" ");
        const extra = a.extra ? `<details><summary>environment / log_extra</summary><pre>${esc(JSON.stringify(a.extra, null, 1))}</pre></details>` : "";
        const own = a.own_rewards ? `<div class="muted">own rewards ${a.own_rewards.map(fmt).join(", ")}</div>` : "";
        const fate = a.child !== null ? `<button data-goto="${a.child}">continues: node ${a.child}</button>` : a.pruned ? '<span class="tag">pruned</span>' : '<span class="tag">ends</span>';
        return (
          `<div class="action${a.pruned ? " pruned" : ""}" data-action="${j}" style="border-top: 4px solid ${colour(a[state.measure])}">` +
          `<h3><span>joint action ${j} (${a.choice.join(", ")})</span><span class="nav">${fate}</span></h3>` +
          `<div class="nums">${num("reward", a.reward)}${num("return", a.return)}</div><div class="muted">${rewards}</div>${own}${extra}` +
          a.choice.map((k, i) => completionHtml(node.agents[i].completions[k], i, k)).join("") +
          "</div>"
        );
      })
      .join("");
    $("panel").innerHTML =
      `<div class="card"><h2>Node ${id} · turn ${node.turn} · mean reward ${fmt(nodeMean(node, "reward"))} · mean return ${fmt(nodeMean(node, "return"))}` +
      `${node.terminated ? ' <span class="tag warn ended">ended early (mean reward above the threshold)</span>' : ""}</h2>` +
      `<div class="nav">${nav.join("")}</div><div class="siblings">siblings: ${sib}</div>${prompts}` +
      `<div class="grid" style="grid-template-columns: repeat(${node.actions.length}, minmax(220px, 1fr))">${actions}</div></div>`;
  }

  // ------------------------------------------------------------------ turn summary and reward curve
  function turnSummary() {
    const doc = state.doc, rows = [];
    for (let t = 1; t <= doc.num_turns; t++) {
      const actions = doc.prompts.flatMap((p) => p.nodes.filter((n) => n.turn === t).flatMap((n) => n.actions));
      const nodes = doc.prompts.flatMap((p) => p.nodes.filter((n) => n.turn === t));
      if (!nodes.length) continue;
      const r = mean(actions.map((a) => a.reward).filter((v) => v !== null));
      const g = mean(actions.map((a) => a.return).filter((v) => v !== null));
      const ended = nodes.filter((n) => n.terminated).length;
      rows.push(`<tr data-turn="${t}"><td>${t}</td><td class="mean-reward" data-value="${r}">${fmt(r)}</td><td>${fmt(g)}</td><td>${nodes.length}</td><td>${ended}</td></tr>`);
    }
    $("turns").innerHTML = `<tr><th>turn</th><th>mean reward</th><th>mean return</th><th>nodes</th><th>ended early</th></tr>${rows.join("")}`;
  }
  const PALETTE = ["#0b5cff", "#d1495b", "#2a9d8f", "#e9a03b", "#6c4ab6", "#555"];
  // About `count` round values from lo to hi: steps of 1, 2, 5 or 10 times a power of ten, the one giving the count
  // nearest `count` (whole numbers when `whole`)
  function ticks(lo, hi, count, whole) {
    const span = hi - lo, unit = Math.pow(10, Math.floor(Math.log10(span / count)));
    const near = (m) => Math.abs(span / (unit * m) - count);
    let step = unit * [1, 2, 5, 10].reduce((best, m) => (near(m) < near(best) ? m : best));
    if (whole) step = Math.max(1, Math.round(step));
    const out = [];
    for (let v = Math.ceil(lo / step - 1e-9) * step; v <= hi + step * 1e-9; v += step) out.push(Number(v.toFixed(10)));
    return { values: out, decimals: whole ? 0 : Math.max(0, -Math.floor(Math.log10(step))) };
  }
  // A series' runs of consecutive logged steps: a step where it has no value (a turn that did not run: every node
  // ended early before it) breaks the line instead of being bridged.
  function segments(points, position) {
    const runs = [];
    points.forEach((p, i) => {
      if (i && position.get(p[0]) === position.get(points[i - 1][0]) + 1) runs[runs.length - 1].push(p);
      else runs.push([p]);
    });
    return runs;
  }
  function drawCurve() {
    const series = INDEX.curve.series, names = Object.keys(series);
    const svg = $("curve"), W = 356, H = 190, L = 48, B = 34, T = 8, R = 10;
    const all = names.flatMap((n) => series[n]);
    if (!all.length) { svg.innerHTML = `<text x="10" y="20">no reward values logged</text>`; return; }
    const steps = [...new Set(all.map((p) => p[0]))].sort((a, b) => a - b);
    const position = new Map(steps.map((s, i) => [s, i]));
    const extent = (vs) => vs.reduce(([a, b], v) => [Math.min(a, v), Math.max(b, v)], [Infinity, -Infinity]);
    let [[x0, x1], [y0, y1]] = [extent(steps), extent(all.map((p) => p[1]))];
    if (x1 === x0) { x0 -= 1; x1 += 1; }
    if (y1 - y0 < 1e-9) { y0 -= 0.5; y1 += 0.5; }
    const sx = (v) => L + ((v - x0) / (x1 - x0)) * (W - L - R);
    const sy = (v) => H - B - ((v - y0) / (y1 - y0)) * (H - B - T);
    const parts = [`<line class="axis" x1="${L}" y1="${H - B}" x2="${W - R}" y2="${H - B}"/><line class="axis" x1="${L}" y1="${T}" x2="${L}" y2="${H - B}"/>`];
    const xt = ticks(x0, x1, 6, true), yt = ticks(y0, y1, 5, false);
    for (const v of xt.values) {
      parts.push(`<line class="tick" x1="${sx(v)}" y1="${H - B}" x2="${sx(v)}" y2="${H - B + 4}"/><text class="xtick" x="${sx(v)}" y="${H - B + 14}" text-anchor="middle">${v}</text>`);
    }
    for (const v of yt.values) {
      parts.push(`<line class="grid" x1="${L}" y1="${sy(v)}" x2="${W - R}" y2="${sy(v)}"/><text class="ytick" x="${L - 4}" y="${sy(v) + 3}" text-anchor="end">${v.toFixed(yt.decimals)}</text>`);
    }
    parts.push(`<text class="axistitle" x="${(L + W - R) / 2}" y="${H - 3}" text-anchor="middle">training step</text>`,
      `<text class="axistitle" transform="translate(11,${(T + H - B) / 2}) rotate(-90)" text-anchor="middle">mean joint reward</text>`);
    const recorded = new Set(INDEX.steps);
    names.forEach((name, j) => {
      const c = PALETTE[j % PALETTE.length], pts = series[name];
      for (const run of segments(pts, position)) {
        const attrs = `class="segment" data-series="${esc(name)}" data-steps="${run.map((p) => p[0]).join(" ")}"`;
        parts.push(run.length > 1
          ? `<polyline ${attrs} fill="none" stroke-width="1.6" stroke="${c}" points="${run.map((p) => `${sx(p[0])},${sy(p[1])}`).join(" ")}"/>`
          : `<circle ${attrs} cx="${sx(run[0][0])}" cy="${sy(run[0][1])}" r="2" fill="${c}"/>`);
      }
      pts.forEach((p) => {
        if (!recorded.has(p[0])) return;
        const cur = p[0] === state.step ? " current" : "";
        parts.push(`<circle class="pt${cur}" data-step="${p[0]}" cx="${sx(p[0])}" cy="${sy(p[1])}" r="3.5" fill="${c}"><title>${esc(name)} at step ${p[0]}: ${fmt(p[1])}</title></circle>`);
      });
    });
    svg.innerHTML = parts.join("");
    $("curvelegend").innerHTML = names.map((name, j) => `<span style="color:${PALETTE[j % PALETTE.length]}">━ ${esc(name)}</span>`).join(" ");
    $("curvesource").textContent = INDEX.curve.source;
  }

  // The panel sits under the tree and the side cards, below the fold of most screens: a node opened by a click is
  // brought to where the reader is looking, its heading at the top of the window (or as high as the page's end lets
  // it). A panel already in view (wholly, or its heading in the window's upper part) stays put, so that stepping
  // through siblings or parents does not move the page.
  function openNode(id) {
    showNode(id);
    const box = $("panel").getBoundingClientRect();
    const inView = box.top >= 0 && (box.bottom <= window.innerHeight || box.top <= window.innerHeight * 0.6);
    if (!inView) $("panel").scrollIntoView({ block: "start", behavior: "smooth" });
  }

  // ------------------------------------------------------------------ events
  document.addEventListener("click", (e) => {
    const node = e.target.closest("#tree .node");
    if (node) return openNode(Number(node.dataset.node));
    const go = e.target.closest("[data-goto]");
    if (go) return openNode(Number(go.dataset.goto));
    const pt = e.target.closest("#curve .pt");
    if (pt) return showStep(Number(pt.dataset.step));
  });
  fillSteps();
  if (INDEX.steps.length) showStep(INDEX.steps[INDEX.steps.length - 1]);
  document.body.dataset.ready = "1";
})();
