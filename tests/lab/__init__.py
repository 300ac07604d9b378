"""A real lab for the transport tests: OpenSSH sshd processes started by the tests themselves."""
