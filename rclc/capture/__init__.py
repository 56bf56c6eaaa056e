"""The seed's import path for the vLLM capture connector, kept working: `rclc.capture.connector`.

The seed's API text configures engines with
`kv_connector_module_path="rclc.capture.connector"`; the connector now lives in
`rclc.vllm.capture.connector` (the vLLM adapter's package). Engines configured either way
load the same module object (see `connector.py` here), so captures land in one registry.
New code should use `rclc.vllm.kv_transfer_config()`.
"""
