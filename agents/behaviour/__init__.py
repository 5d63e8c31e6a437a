"""Simulator behaviour, measured the same way by both halves: COLLAPSE-AWARE's measures
(measures.py), the behaviour space they are taken in (space.py: k-means on embedded turns) and
the default embedder (embedder.py: mean-pooled hidden states of a local model folder).

It lives in agents because training (every step's profiles, training/measures/profiles.py) and
studies (the sim-to-real report against a study's own participants) both need it, and the
layers let neither import the other; nothing here imports Django or either of them."""
