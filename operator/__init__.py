"""The model-support operator: ModelSupportTest resources reconciled by kopf into runner Jobs.

Handlers only orchestrate: sizing, rendering run.py and recording results are core-package
functions (model_support.sizing, model_support.script, model_support.execution, model_support.store).
Import the handlers with ``model_support.operator.handlers.build_registry``.
"""
