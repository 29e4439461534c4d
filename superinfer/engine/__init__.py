"""The real engine: model runner, transfer engines, step loop, offline API."""
