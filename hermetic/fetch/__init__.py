"""fetch: bytes from the network, verified before anyone sees them. ``session`` holds the HTTP session with
pip's settings, the retries and the error vocabulary (also the remote cache's); ``index`` is the
simple-repository client; ``pipconfig`` reads pip's configuration; ``download`` fetches a locked wheel."""
