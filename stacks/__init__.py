"""Deployable units: each stack composes constructs from cdk_constructs/."""
