# bench/gpu/pieces.sh — sourced by stage.sh and stage_cpu_engines.sh: the default size of a bundle piece.
# A transfer carries a piece beside the repository's tracked files, 64 MiB in all: by default each piece gets what
# the tree leaves, less 2 MiB (the tree grows with committed results: 8 MiB on 2026-12-02, 14 on 2026-12-07).
default_piece_mib() {
  echo $(( 62 - ($(git ls-files -z | du -cb --apparent-size --files0-from=- | tail -1 | cut -f1) + 1048575) / 1048576 ))
}
