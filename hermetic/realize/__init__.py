"""realize: a recipe into the store. ``pipeline.realize`` reads as the steps: the no-op check (``noop``),
validate, qualify, fetch (``wheels``), materialize (``store.trees``), toolchain, sources, build and check
(``build``), receipt (``receipt``) and gc root (``store.roots``). ``env`` is what ``hermetic env`` prints."""
