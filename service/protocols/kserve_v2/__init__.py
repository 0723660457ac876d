"""The Open Inference Protocol (KServe v2 REST, as Triton implements it).

    request (JSON header | binary data, parameters) ─► wire (msgspec structs)
      ─► tensors (JSON data or binary buffers -> arrays) ─► layout (which tensor is which
      leaf) ─► handler (Rows, ActService) ─► response (outputs as JSON or binary)
      ; errors ({"error": "..."})

``route`` plugs ``POST /v2/models/{name}[/versions/{v}]/infer`` into the fast path next to
act; ``rlserve.service.api.inference_v2`` documents it and serves the GET endpoints.
``grpc_server`` serves the same calls over gRPC (``RLSERVE_GRPC_PORT``): a
``ModelInferRequest`` becomes the REST body and joins ``handler`` after the decode.
"""
