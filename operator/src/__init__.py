"""The model-support operator: ModelSupportTest resources reconciled by kopf into runner Jobs.

``handlers`` wires kopf's events to the ``reconciler`` (state in the test's status, children
named deterministically); ``planning`` decides what a test needs (sizing, placement) and builds
its children with ``manifests``; ``outcome`` reads a finished Job; ``status`` is the typed
status. Sizing, rendering run.py and recording results are core-package functions
(model_support.sizing, model_support.script, model_support.records, model_support.store).
Import the handlers with ``model_support.operator.handlers.build_registry``.
"""
