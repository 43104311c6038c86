"""Tests against real deployments: Redis Cluster, ACL users, TLS and Sentinel."""
