"""Test doubles and the test host, for the tests and the demo only; never used by a real run.

Everything here stands in for something that cannot run on this machine (a GPU, nvidia-smi,
the public Hugging Face Hub, an SGLang server on GPUs) and answers in the real thing's formats.
"""
