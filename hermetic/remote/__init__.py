"""remote: sharing through a remote cache. ``settings`` (which cache, read-only or read-write, credentials),
``backend`` (what hermetic needs of a server), ``bazel`` (Bazel's HTTP cache protocol), ``actionresult``
(REAPI's ActionResult on the wire), ``layout`` (where hermetic's wheels, objects and modules lie on the
server: the ``Sharing`` a build and a realize use)."""
