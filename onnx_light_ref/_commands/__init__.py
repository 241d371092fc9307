"""Sub-commands of the ``onnx-light-ref`` CLI, one module each (see ``onnx_light_ref._cli``); ``sizes`` parses the
byte-size arguments they share."""
