"""wheels: every locked wheel as an unpacked entry of the store (``unpacked``), unpacked once through the
installer library (``unpack``)."""
