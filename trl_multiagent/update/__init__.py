"""The update: a tree's rows as padded batches and micro-batches (`batching`), the update in chunks of bounded size
(`chunking`), each distinct prompt run once for the rows that continue it (`prefix`), vLLM's importance-sampling
correction (`importance`), GRPOConfig's entropy bonus per agent (`entropy`), and the values of TRL's `_compute_loss`
handed over inside that one call (`loss_call`)."""
