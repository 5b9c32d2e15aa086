"""ravenproxy: cloud-edge networking for Kubernetes clusters whose edge nodes sit behind NAT."""

__version__ = "0.1.0"
