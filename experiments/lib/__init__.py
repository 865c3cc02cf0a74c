"""What the entry points share: config to run objects (``setup``), result files
(``results``) and Hydra callbacks (``callbacks``)."""
