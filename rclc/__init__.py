"""rclc: receiver-conditioned state transfer between agents that share one local model.

The whole public surface is re-exported here; implementation lives in one-job modules.
"""

from .agent import Agent, bind
from .doctor import check
from .hf import HFReceiver, sender_from_hf
from .reasoning import latent_mass, latent_mass_sync
from .state import Delivery, Message, SenderState
from .transfer import transfer, transfer_sync

__version__ = "0.1.0"

__all__ = [
    "Agent",
    "Delivery",
    "HFReceiver",
    "Message",
    "SenderState",
    "__version__",
    "bind",
    "check",
    "latent_mass",
    "latent_mass_sync",
    "sender_from_hf",
    "transfer",
    "transfer_sync",
]
