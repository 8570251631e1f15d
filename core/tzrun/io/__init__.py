"""Where a run's bytes go: local paths and object storage (:mod:`tzrun.io.storage`), the
model dir's record files (:mod:`tzrun.io.files`), and how a failed write is reported
(:mod:`tzrun.io.write_errors`)."""
