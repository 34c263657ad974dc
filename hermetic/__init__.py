"""hermetic: a content-addressed store, hermetic CUDA/C++ extension builds, and whole-worker measurement.

The pipeline, one subpackage per concern (docs/architecture.md draws the arrows):

    realize = recipe (validate) -> extensions.host (qualify) -> wheels (fetch, unpack) -> store.trees (materialize)
              -> extensions.toolchain -> extensions.sources -> extensions (compile with certified reuse, link)
              -> extensions.importcheck -> realize.receipt + store.roots
    run     = run.spec (validate) -> realize -> run.devices (lock, preconditions) -> run.child (measure)
              -> run.digests + run.analysis (check, statistics) -> run.report -> receipt
    gc      = store.roots + temp roots -> mark -> invalidate (rename to trash) -> delete (store.gc)
    verify  = re-hash blobs, trees and entries; --repair drops what is corrupt and realizes again

Below them: ``locks`` (pip hash locks, PEP 751), ``fetch`` (HTTP, indexes, pip's configuration), ``remote``
(a Bazel HTTP cache), and the single modules ``store`` rests on: ``fs`` (atomic writes, links, locks,
hashing), ``root`` (the scratch root and the child environment), ``errors`` (exit codes), ``reporter``
(what users see), ``procs`` (children that die with hermetic), ``keys`` (object keys, pure).
"""

__version__ = "0.1.0"
