"""losslessness: statistical verification and property testing for speculative decoding.

It tells whether a speculative-decoding verifier is lossless (emitted tokens follow the target
distribution p exactly; greedy output equals argmax decoding), with stated error rates.
"""

__version__ = "0.1.0"
