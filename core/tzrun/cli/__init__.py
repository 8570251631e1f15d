"""The command-line face: ``tzrec-run``'s parser (:mod:`tzrun.cli.main`), the commands it
calls into the Session and the tools (:mod:`tzrun.cli.commands`), the agent of
``--nproc-per-node`` runs (the launcher protocol it shares with the ranks is
:mod:`tzrun.runner.launch`), help topics and logging set-up. The kernel and the run never
import it."""
