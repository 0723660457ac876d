"""Other wire protocols on the same act use case (``rlserve.service.act.use_case``).

Each protocol decodes its own requests into ``Rows`` and encodes its own answers; sessions,
validation, batching and the runtime are the JSON API's, so requests of every protocol
share batches. ``kserve_v2``: the Open Inference Protocol (KServe v2 REST, as Triton
speaks it), with Triton's binary tensor data and sequence extensions.
"""
