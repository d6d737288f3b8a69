# bash completion for cairn                                    -*- shell-script -*-
#
# Candidates come from the CLI itself: 'cairn __complete -- WORD... CURRENT' prints one
# "VALUE<TAB>DESCRIPTION" a line, or ":file" (or nothing) where file names fit.
# Words are read from COMP_LINE so that "builtin:NAME" stays one word.

_cairn() {
    local line=${COMP_LINE:0:COMP_POINT} cur="" prefix="" answer value files=""
    local -a words=() found=()
    read -ra words <<<"$line"
    if [[ $line != *[[:space:]] && ${#words[@]} -gt 0 ]]; then
        cur=${words[-1]}
        unset 'words[-1]'
    fi
    # Readline replaces only what follows the last ':' or '=' of the word.
    [[ $cur == *[:=]* ]] && prefix=${cur%"${cur##*[:=]}"}
    COMPREPLY=()
    while IFS= read -r answer; do
        if [[ $answer == :file ]]; then
            files=1
            continue
        fi
        value=${answer%%$'\t'*}
        [[ -n $value && $value == "$cur"* ]] && found+=("${value#"$prefix"}")
    done < <(cairn __complete -- "${words[@]}" "$cur" 2>/dev/null)
    COMPREPLY=("${found[@]}")
    if [[ -n $files || ${#found[@]} -eq 0 ]]; then
        local IFS=$'\n'
        COMPREPLY+=($(compgen -f -- "$cur"))
        compopt -o filenames 2>/dev/null
    fi
    return 0
}

complete -F _cairn cairn
