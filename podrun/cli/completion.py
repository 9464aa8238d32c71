"""podrun's shell completion scripts: click's, with bash completing file names beside the names podrun gives."""
from __future__ import annotations

from click.shell_completion import BashComplete, add_completion_class

# click's bash script, but a `file` or `dir` item adds the shell's file (directory) names to the candidates
# instead of clearing them: `podrun plan res<Tab>` offers the recipes named res* and the paths res*
BASH_SOURCE = r"""%(complete_func)s() {
    local IFS=$'\n'
    local response

    response=$(env COMP_WORDS="${COMP_WORDS[*]}" COMP_CWORD=$COMP_CWORD %(complete_var)s=bash_complete $1)

    for completion in $response; do
        IFS=',' read type value <<< "$completion"

        if [[ $type == 'dir' ]]; then
            compopt -o filenames 2>/dev/null
            COMPREPLY+=($(compgen -d -- "$value"))
        elif [[ $type == 'file' ]]; then
            compopt -o filenames 2>/dev/null
            COMPREPLY+=($(compgen -f -- "$value"))
        elif [[ $type == 'plain' ]]; then
            COMPREPLY+=($value)
        fi
    done

    return 0
}

%(complete_func)s_setup() {
    complete -o nosort -F %(complete_func)s %(prog_name)s
}

%(complete_func)s_setup;
"""


class PodrunBashComplete(BashComplete):
    source_template = BASH_SOURCE


def register() -> None:
    """`_PODRUN_COMPLETE=bash_source podrun` prints BASH_SOURCE (zsh and fish: click's own)."""
    add_completion_class(PodrunBashComplete, "bash")
