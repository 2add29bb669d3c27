"""Trajectories: the store's rollouts exported as training rows (``export``), shown to people
(``render``, ``transcript``) and their images read back (``request_images``)."""
