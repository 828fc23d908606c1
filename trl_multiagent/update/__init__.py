"""The update: a tree's rows as padded batches and micro-batches (`batching`), the update in chunks of bounded size
(`chunking`), each distinct prompt run once for the rows that continue it (`prefix`), and vLLM's importance-sampling
correction (`importance`)."""
