"""Ingestion and delivery operators: the framework's transforms, registered with Conduit."""

from conduit.ops.delivery import Delivery, DeliveryPlan, Part, Request
from conduit.ops.operator import Operator, run_chain

__all__ = ["Delivery", "DeliveryPlan", "Operator", "Part", "Request", "run_chain"]
