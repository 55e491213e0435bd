"""The boot services: DHCP, TFTP and DNS servers, iPXE scripts, and the boot table they share."""
