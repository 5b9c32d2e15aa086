"""ravenproxy.l3"""
