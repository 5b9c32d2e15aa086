"""ravenproxy.controller"""
