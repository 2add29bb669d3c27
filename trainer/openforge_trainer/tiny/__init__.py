"""The tiny offline policy: its tokenizer and chat template (``tokenizer_build``), its model
(``model_build``), its supervised warm start (``warmstart``), its evaluation (``policy_eval``) and
``openforge model`` (``cli``)."""
