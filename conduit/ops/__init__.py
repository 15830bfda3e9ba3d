"""Ingestion and delivery operators: the framework's transforms, registered with Conduit."""

from conduit.ops.delivery import Delivery, DeliveryPlan
from conduit.ops.operator import Operator, run_chain

__all__ = ["Delivery", "DeliveryPlan", "Operator", "run_chain"]
