"""The read side: queries of the stored results and one view of each API object for every client."""
