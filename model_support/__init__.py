"""model-support: does a Hugging Face model run unmodified on AWS Trainium (TorchNeuron)?"""

__version__ = "0.1.0"
