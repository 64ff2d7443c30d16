"""What one sample times: the decode loop, a request, contexts; the gate; one run end to end; text quality."""
