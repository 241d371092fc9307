"""Reading: what a model names, opened safely, parsed without its weights.

``folder`` (the one opener, relative to a held descriptor of the model's folder), ``proto`` (onnx's protobuf classes,
without importing the onnx package and numpy), ``model_file`` (metadata-only parsing), ``wire`` (parsing without
inline payloads), ``walker`` (every tensor of a model and where it lives),
``entries`` (the one reader and writer of ``external_data`` entries), ``locations`` (validation of references and
byte ranges), ``dtype_sizes`` (bytes per element type), ``loader_rule`` (which loader refuses a reference, and why),
``safetensors_header`` (write one, parse one as hostile input), ``safetensors_refs`` (does a reference agree with
its file's header), ``strict_json`` (untrusted JSON: no repeated key, no runaway nesting), ``sharing`` (which models
can reach and reference which files: rule 1 of the writer contract), ``delayed_names`` (how a ``DelayedInitializer``
node is spelled).

Nothing here writes a file.
"""
