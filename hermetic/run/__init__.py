"""run: the whole-worker measurement. ``pipeline.run`` reads as the steps: realize what the runner needs,
lock the device (``devices``), check it, measure in the child (``child``, a module that imports nothing from
hermetic, so this package's init stays empty), check exactness and digests (``digests``), analyse
(``analysis``, ``stats``), write the report (``report``) and the receipt. ``spec`` reads runner files;
``gpu`` reads NVML; ``guard`` watches resident memory."""
