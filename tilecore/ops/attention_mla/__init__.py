"""MLA prefill's Gluon backward kernels (q/k head dim 192, v's 128; issue 35), served by
``tilecore.attention`` (attention's plan routes these sizes: configs.GLUON_BACKWARD_DV, GLUON_DQ_DV):

* ``gluon_backward``: dK and dV by 64-column pieces (AttentionBackwardPieces, attention_bwd_mla_kernel);
* ``gluon_dq``: dQ by 64-column pieces after it (AttentionDQPieces, attention_dq_mla_kernel).

The forward at these sizes is attention's Gluon forward with Q and K in pieces (gluon_kernels.py), and
MLA decode (576 / 512 over one latent) attention's split-key kernel. No public function of its own.
"""
