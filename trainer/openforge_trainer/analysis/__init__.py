"""Analysis: stored rollouts decoded into agent episodes (``episodes``), the behaviour metrics over
them (``metrics``) and ``openforge analyze`` (``cli``)."""
