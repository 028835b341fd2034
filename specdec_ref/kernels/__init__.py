"""Faster forms of the same linear layers, for CPU decoding: GGUF codes and bf16 copies read by the
course's own C++ kernels, prepacked oneDNN weights, weights-first products, ``torch.compile``.

:mod:`~specdec_ref.kernels.fast` (``prepare``) and :mod:`~specdec_ref.kernels.weights_first`
(``weights_first``) build a model's fast copy; :func:`specdec_ref.modules.like` builds any other
module in the same form as a prepared model. ``import specdec_ref`` loads none of them.
"""
