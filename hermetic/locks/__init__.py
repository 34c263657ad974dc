"""locks: lock files into the wheels to fetch. ``read.read_lock`` picks the format (``piplock``: pip hash
locks; ``pylock``: PEP 751), both checked by the shared validators (``validate``) into the records of
``types``; ``cache`` keeps parsed locks by stat fingerprint, so a no-op never imports packaging."""
