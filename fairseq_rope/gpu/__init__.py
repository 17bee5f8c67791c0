"""What a GPU node needs: the offline wheelhouse (:mod:`.wheelhouse`); the suite itself
is ``scripts/gpu_suite.sh``."""
