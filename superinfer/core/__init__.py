"""Scheduling core: requests, scheduler, policies and KV bookkeeping.

Pure Python: never imports torch and never reads the clock (callers pass `now`), so the
engine, the simulator and the tests all drive the same objects.
"""
