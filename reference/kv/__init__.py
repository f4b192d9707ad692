"""KV-cache geometry: cache specs (bytes a block occupies, where each layer lies), allocation, packed MLA codecs."""
