"""The sending side: publishers (dense, sparse), the transfer server, the versions it keeps, the
sparse reply of a bucket, and relays with their upstream link."""
