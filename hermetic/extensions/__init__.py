"""extensions: hermetic extension builds with certified object reuse.

``variants.build_recipe`` builds every variant of a recipe: the toolchain (``toolchain``), the host
interpreter (``host``), the sources and patches (``sources``), then each extension (``extension``): torch's
commands (``plan``), reuse of what the object cache certifies (``objects``, keys in ``hermetic.keys``), ninja
for the rest, the link, the certificate (``certificate``). ``importcheck`` imports the modules together;
``rebuild`` is ``verify --rebuild-sample``; ``share`` says what a build asks of a remote cache.
"""
