"""The rlserve client side: an HTTP client for policies, a gymnasium runner and the demo.

Imports nothing of the server (a test checks it), so an environment process needs only
httpx (and gymnasium for the runner).
"""

from rlserve.client.policy_client import ActResult, AsyncPolicyClient, PolicyClient, RLServeError

__all__ = ["ActResult", "AsyncPolicyClient", "PolicyClient", "RLServeError"]
