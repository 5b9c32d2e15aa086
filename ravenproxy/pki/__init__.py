"""ravenproxy.pki"""
