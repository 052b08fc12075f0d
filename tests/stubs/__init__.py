"""Local HTTP stand-ins for provider APIs, driven through the real provider clients."""
