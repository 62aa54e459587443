"""The package's version: the version of the API it speaks (``info.version`` of openapi/openapi.json).

A client release for a new API version takes that version; a fix of the client
alone adds a fourth part (``0.1.0.1``). tests/test_packaging.py checks it.
"""

__version__ = "0.1.0"
