"""Reusable CDK constructs. Not named `constructs`: that would shadow the library aws-cdk-lib imports."""
