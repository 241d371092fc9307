"""Planning: where each byte of a writer's output goes, decided before anything is written.

``alignment`` (offset arithmetic), ``placement`` (alignment threshold, size-capped shards, zero-length tensors at the
end), ``dedup`` (identical blobs stored once), ``safetensors_layout`` (keys, dtypes and order in safetensors files),
``shard_names`` (ours, Hugging Face's and transformers.js's file names), ``sites`` (which tensors may become external
and where their bytes may sit: rule 2 of the writer contract), ``align_plan`` (the aligners' whole plan).

Nothing here writes a file; the only bytes read are those dedup compares and small typed-field payloads.
"""
