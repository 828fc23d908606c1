#!/usr/bin/env bash
# The vLLM checks that need a GPU *and vLLM for CUDA*, in one short run (no model hub needed: tiny models are built
# offline). The lent device has no vLLM and cannot receive it (its wheels are hundreds of MB): run this on a GPU
# machine of your own. `benchmarks/gpu_check.sh` is the check that fits the lent device.
#   1. the vLLM test suite on CUDA (colocate: greedy agreement, real syncs, sampling log-probs, LoRA engine);
#   2. sleep mode on a shared-base LoRA team (one engine per process; vLLM's sleep mode is CUDA-only);
#   3. server mode end to end: one `trl vllm-serve` per agent, weight syncs over NCCL.
# Usage, from the repository root on a machine with one or more GPUs and vLLM installed (`pip install -e ".[vllm,test]"`):
#   bash benchmarks/gpu_vllm_check.sh
set -euo pipefail
cd "$(dirname "$0")/.."
WORK=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$WORK"' EXIT
python -c "import torch, vllm; assert torch.cuda.is_available(); print('vllm', vllm.__version__, torch.cuda.get_device_name())"

echo "== 1. vLLM tests on CUDA"
python -m pytest -q -m vllm -k "not server and not distributed and not zero3 and not two_processes"

echo "== 2. sleep mode, shared-base LoRA team"
python - <<'PY'
from datasets import Dataset
from peft import LoraConfig
from trl_multiagent import MAGRPOConfig, MAGRPOTrainer
from trl_multiagent.demo.examples import PROMPTS, length_feedback, length_ratio_reward
from trl_multiagent.demo.testing import make_model, make_tokenizer

tok = make_tokenizer()
args = MAGRPOConfig(output_dir="/tmp/gpu_check_sleep", use_vllm=True, vllm_enable_sleep_mode=True, num_turns=2,
                    num_generations=4, max_new_tokens=16, per_device_train_batch_size=8, max_steps=2, bf16=False,
                    early_termination_threshold=None, report_to="none", save_strategy="no", logging_steps=1)
trainer = MAGRPOTrainer(model=make_model(tok, hidden=64, heads=2).cuda(), num_agents=2, tokenizer=tok,
                        peft_config=LoraConfig(r=8, target_modules=["q_proj", "v_proj"]),
                        reward_func=length_ratio_reward, external_transition=length_feedback,
                        train_dataset=Dataset.from_dict({"prompt": PROMPTS}), args=args)
trainer.train()
steps = [e for e in trainer.state.log_history if "sampling/sampling_logp_difference/max" in e]
assert len(steps) == 2 and all(e["sampling/sampling_logp_difference/max"] < 1e-3 for e in steps), steps
print("sleep mode OK:", [round(e["sampling/sampling_logp_difference/max"], 7) for e in steps])
PY

echo "== 3. server mode: one trl vllm-serve per agent"
python - "$WORK" <<'PY'
import sys
from trl_multiagent.demo.testing import make_model, make_tokenizer
tok = make_tokenizer()
for i in range(2):
    make_model(tok, seed=i, hidden=64, heads=2).save_pretrained(f"{sys.argv[1]}/agent_{i}")
    tok.save_pretrained(f"{sys.argv[1]}/agent_{i}")
PY
NGPU=$(python -c "import torch; print(torch.cuda.device_count())")
for i in 0 1; do
    GPU=$(( NGPU > 1 ? i + 1 : 0 ))  # the trainer takes GPU 0 when there are more
    CUDA_VISIBLE_DEVICES=$GPU trl vllm-serve --model "$WORK/agent_$i" --port $((8000 + i)) \
        --gpu_memory_utilization 0.2 --logprobs-mode processed_logprobs > "$WORK/server_$i.log" 2>&1 &
done
CUDA_VISIBLE_DEVICES=0 python - "$WORK" <<'PY'
import sys
from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl_multiagent import MAGRPOConfig, MAGRPOTrainer
from trl_multiagent.demo.examples import PROMPTS, length_feedback, length_ratio_reward

work = sys.argv[1]
agents = [AutoModelForCausalLM.from_pretrained(f"{work}/agent_{i}").cuda() for i in range(2)]
args = MAGRPOConfig(output_dir=f"{work}/run", use_vllm=True, vllm_mode="server", vllm_server_timeout=300,
                    vllm_server_base_urls=["http://127.0.0.1:8000", "http://127.0.0.1:8001"], num_turns=2,
                    num_generations=4, max_new_tokens=16, per_device_train_batch_size=8, max_steps=3, bf16=False,
                    learning_rate=1e-3, early_termination_threshold=None, report_to="none", save_strategy="no",
                    logging_steps=1)
trainer = MAGRPOTrainer(agents=agents, tokenizer=AutoTokenizer.from_pretrained(f"{work}/agent_0"),
                        reward_func=length_ratio_reward, external_transition=length_feedback,
                        train_dataset=Dataset.from_dict({"prompt": PROMPTS * 3}), args=args)
trainer.train()
steps = [e for e in trainer.state.log_history if "sampling/sampling_logp_difference/max" in e]
# Steps 2 and 3 sample from synced weights: a failed NCCL sync shows as a large difference.
assert len(steps) == 3 and all(e["sampling/sampling_logp_difference/max"] < 1e-2 for e in steps), steps
print("server mode OK:", [round(e["sampling/sampling_logp_difference/max"], 6) for e in steps])
PY
echo "gpu_check: all passed"
