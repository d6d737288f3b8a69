# fish completion for cairn. Candidates come from the CLI itself:
# 'cairn __complete -- WORD... CURRENT' prints one "VALUE<TAB>DESCRIPTION" a line (the
# form fish reads), or ":file" (or nothing) where file names fit.

function __cairn_complete
    set -l words (commandline -opc)
    set -l current (commandline -ct)
    set -l found
    set -l files 0
    for answer in (cairn __complete -- $words "$current" 2>/dev/null)
        if test "$answer" = ":file"
            set files 1
        else if test -n "$answer"
            set -a found $answer
        end
    end
    if set -q found[1]
        printf '%s\n' $found
    end
    if test $files = 1; or not set -q found[1]
        __fish_complete_path "$current"
    end
end

complete --command cairn --no-files --arguments '(__cairn_complete)'
