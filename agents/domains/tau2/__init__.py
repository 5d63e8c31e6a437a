"""tau2-bench retail and airline as parley Domains (see domain.py; data loading in data.py)."""

from .domain import AirlineDomain, RetailDomain, Tau2Domain

__all__ = ["AirlineDomain", "RetailDomain", "Tau2Domain"]
