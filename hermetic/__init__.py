"""hermetic: a content-addressed store, hermetic CUDA/C++ extension builds, and whole-worker measurement.

The pipeline, one module per step:

    realize = recipe (validate) -> lockfiles + pipconfig (qualify) -> fetch (verified download)
              -> materialize (installer -> blobs -> tree -> profile) -> toolchain -> receipt
    gc      = roots + temp roots -> mark -> invalidate (rename to trash) -> delete
    verify  = re-hash blobs, trees and entries; --repair drops what is corrupt and realizes again

Foundations: ``store`` (the invariant), ``fs`` (atomic writes, links, locks, hashing), ``root`` (the
scratch root and the child environment), ``errors`` (exit codes), ``reporter`` (what users see).
"""

__version__ = "0.1.0"
