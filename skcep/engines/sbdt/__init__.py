"""Streaming Bayesian deep tensor factorization (SBDT; Fang, Wang, Pan, Liu and Zhe, ICML 2021):
one-pass assumed density filtering over a Bayesian neural network on embeddings."""
